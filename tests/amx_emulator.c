/* AMX's tile registers in software, for tests on CPUs without AMX (tests/test_amx_tiles.py): each
 * function stands for the instruction of its name, on one thread's 8 tiles of up to 16 rows x 64 bytes,
 * each moving and multiplying the rows its thread configured (palette 1). An instruction on a tile not
 * configured as rows of 64 bytes, or a product whose tiles' shapes do not match (C and A the same rows,
 * B 16 rows: 32 bf16 of A's row) or that names one tile twice (the instruction faults), counts an error. */
#include <stdint.h>
#include <string.h>
static __thread unsigned char tiles[8][1024];
static __thread unsigned char rows[8], colsb_ok[8];
static long counts[5]; /* configurations, tile loads, products, tile stores, errors */
static void count(int i) { __atomic_add_fetch(&counts[i], 1, __ATOMIC_RELAXED); }
static float bf16(uint16_t x) { uint32_t u = (uint32_t)x << 16; float f; memcpy(&f, &u, 4); return f; }
/* Whether a tile is configured: 1 to 16 rows of 64 bytes (else an error is counted). */
static int ready(int t) {
  if (t >= 0 && t <= 7 && rows[t] >= 1 && rows[t] <= 16 && colsb_ok[t]) return 1;
  count(4); return 0;
}
int ansor_emu_ldtilecfg(const unsigned char* cfg) {
  for (int t = 0; t < 8; ++t) {
    rows[t] = cfg[0] == 1 ? cfg[48 + t] : 0;
    colsb_ok[t] = cfg[16 + 2 * t] == 64 && cfg[17 + 2 * t] == 0;
  }
  memset(tiles, 0, sizeof tiles); count(0); return 0;
}
int ansor_emu_tileloadd64(int8_t t, const char* p, int64_t stride) {
  if (!ready(t)) return 0;
  for (int r = 0; r < rows[t]; ++r) memcpy(tiles[t] + 64 * r, p + r * stride, 64);
  count(1); return 0;
}
int ansor_emu_tilestored64(int8_t t, char* p, int64_t stride) {
  if (!ready(t)) return 0;
  for (int r = 0; r < rows[t]; ++r) memcpy(p + r * stride, tiles[t] + 64 * r, 64);
  count(3); return 0;
}
int ansor_emu_tdpbf16ps(int8_t c, int8_t a, int8_t b) {
  if (!ready(c) || !ready(a) || !ready(b)) return 0;
  if (rows[c] != rows[a] || rows[b] != 16 || c == a || c == b || a == b) { count(4); return 0; }
  float* C = (float*)tiles[c];
  const uint16_t* A = (const uint16_t*)tiles[a];
  const uint16_t* B = (const uint16_t*)tiles[b];
  for (int i = 0; i < rows[c]; ++i)
    for (int j = 0; j < 16; ++j) {
      float s = C[i * 16 + j];
      for (int k = 0; k < 16; ++k)
        s += bf16(A[i * 32 + 2 * k]) * bf16(B[k * 32 + 2 * j])
             + bf16(A[i * 32 + 2 * k + 1]) * bf16(B[k * 32 + 2 * j + 1]);
      C[i * 16 + j] = s;
    }
  count(2); return 0;
}
long ansor_emu_count(int i) { return __atomic_exchange_n(&counts[i], 0, __ATOMIC_RELAXED); }
