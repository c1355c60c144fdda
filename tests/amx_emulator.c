/* AMX's tile registers in software, for tests on CPUs without AMX (tests/test_amx_tiles.py): each
 * function stands for the instruction of its name, on one thread's 8 tiles of 16 rows x 64 bytes. An
 * instruction before a valid configuration (palette 1; tiles 0-2 of 16 rows x 64 bytes) counts an error. */
#include <stdint.h>
#include <string.h>
static __thread unsigned char tiles[8][1024];
static __thread int configured;
static long counts[6]; /* configurations, accumulator loads, other loads, products, stores, errors */
static void count(int i) { __atomic_add_fetch(&counts[i], 1, __ATOMIC_RELAXED); }
static float bf16(uint16_t x) { uint32_t u = (uint32_t)x << 16; float f; memcpy(&f, &u, 4); return f; }
int ansor_emu_ldtilecfg(const unsigned char* cfg) {
  int ok = cfg[0] == 1;
  for (int t = 0; t < 3; ++t) ok &= cfg[16 + 2 * t] == 64 && cfg[17 + 2 * t] == 0 && cfg[48 + t] == 16;
  if (!ok) count(5);
  configured = ok; memset(tiles, 0, sizeof tiles); count(0); return 0;
}
int ansor_emu_tileloadd64(int8_t t, const char* p, int64_t stride) {
  if (!configured) { count(5); return 0; }
  for (int r = 0; r < 16; ++r) memcpy(tiles[t] + 64 * r, p + r * stride, 64);
  count(t == 0 ? 1 : 2); return 0;
}
int ansor_emu_tilestored64(int8_t t, char* p, int64_t stride) {
  if (!configured) { count(5); return 0; }
  for (int r = 0; r < 16; ++r) memcpy(p + r * stride, tiles[t] + 64 * r, 64);
  count(4); return 0;
}
int ansor_emu_tdpbf16ps(int8_t c, int8_t a, int8_t b) {
  if (!configured) { count(5); return 0; }
  float* C = (float*)tiles[c]; const uint16_t* A = (const uint16_t*)tiles[a]; const uint16_t* B = (const uint16_t*)tiles[b];
  for (int i = 0; i < 16; ++i)
    for (int j = 0; j < 16; ++j) {
      float s = C[i * 16 + j];
      for (int k = 0; k < 16; ++k)
        s += bf16(A[i * 32 + 2 * k]) * bf16(B[k * 32 + 2 * j]) + bf16(A[i * 32 + 2 * k + 1]) * bf16(B[k * 32 + 2 * j + 1]);
      C[i * 16 + j] = s;
    }
  count(3); return 0;
}
long ansor_emu_count(int i) { return __atomic_exchange_n(&counts[i], 0, __ATOMIC_RELAXED); }
