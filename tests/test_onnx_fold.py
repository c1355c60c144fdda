"""ONNX exports with shape subgraphs (BERT-style) import after folding, and compute the same outputs.

The test builds a small transformer layer with onnx.helper in the form ``torch.onnx.export`` gives Hugging
Face BERT: shapes read with ``Shape -> Gather -> Unsqueeze -> Concat``, ``position_ids[:, :seq]`` by
``Slice``, ``token_type_ids`` by the exporter's ``expand`` (``ConstantOfShape`` + ``Where``), heads split
by ``Reshape`` to a computed shape, and the attention mask broadcast to (batch, 1, 1, seq).
"""

import numpy as np
import pytest

onnx = pytest.importorskip("onnx", reason="the onnx package is not installed (pip install 'ansor[onnx]')")
from onnx import TensorProto as TP, helper as h, numpy_helper as nh  # noqa: E402

from ansor.networks import build, extract, load_onnx, run  # noqa: E402
from ansor.networks.onnx_fold import fold_shape_subgraphs  # noqa: E402

TARGET = {"kind": "llvm", "num-cores": 2}
B, S, H, HEADS, VOCAB = 2, 8, 16, 2, 50


def weights() -> dict:
    rng = np.random.default_rng(0)
    return {"word_emb": rng.standard_normal((VOCAB, H)).astype(np.float32),
            "pos_emb": rng.standard_normal((32, H)).astype(np.float32),
            "type_emb": rng.standard_normal((2, H)).astype(np.float32),
            "wq": (rng.standard_normal((H, H)) * 0.3).astype(np.float32),
            "wk": (rng.standard_normal((H, H)) * 0.3).astype(np.float32)}


def transformer_onnx():
    consts = {"position_ids_buf": np.arange(32, dtype=np.int64)[None, :], "c0": np.array(0, np.int64),
              "c1": np.array(1, np.int64), "z1": np.array([0], np.int64), "o1": np.array([1], np.int64),
              "m1": np.array([-1], np.int64), "neg1": np.array(-1, np.int64),
              "heads": np.array([HEADS], np.int64), "hd": np.array([H // HEADS], np.int64),
              "one_f": np.array(1.0, np.float32), "minf": np.array(-10000.0, np.float32)}
    inits = [nh.from_array(v, k) for k, v in {**weights(), **consts}.items()]
    one = nh.from_array(np.array([1], np.int64))
    zero = nh.from_array(np.array([0], np.int64))
    nodes = [
        h.make_node("Shape", ["input_ids"], ["shp"]),
        h.make_node("Gather", ["shp", "c0"], ["bsz"], axis=0),
        h.make_node("Gather", ["shp", "c1"], ["seq"], axis=0),
        h.make_node("Unsqueeze", ["bsz", "z1"], ["bsz1"]),
        h.make_node("Unsqueeze", ["seq", "z1"], ["seq1"]),
        h.make_node("Slice", ["position_ids_buf", "z1", "seq1", "o1"], ["pos_ids"]),  # buffer[:, :seq]
        # token_type_ids = zeros.expand(bsz, seq), as torch.onnx exports expand
        h.make_node("Concat", ["bsz1", "seq1"], ["size0"], axis=0),
        h.make_node("Reshape", ["size0", "m1"], ["size"]),
        h.make_node("Shape", ["size"], ["size_shape"]),
        h.make_node("ConstantOfShape", ["size_shape"], ["ones"], value=one),
        h.make_node("Mul", ["ones", "neg1"], ["neg_ones"]),
        h.make_node("Equal", ["size", "neg_ones"], ["is_neg"]),
        h.make_node("Where", ["is_neg", "ones", "size"], ["size2"]),
        h.make_node("ConstantOfShape", ["size2"], ["tt_ids"], value=zero),
        h.make_node("Gather", ["word_emb", "input_ids"], ["we"], axis=0),
        h.make_node("Gather", ["pos_emb", "pos_ids"], ["pe"], axis=0),
        h.make_node("Gather", ["type_emb", "tt_ids"], ["te"], axis=0),
        h.make_node("Add", ["we", "pe"], ["e1"]),
        h.make_node("Add", ["e1", "te"], ["emb"]),
        # extended attention mask: (1 - mask[:, None, None, :]) * -10000
        h.make_node("Unsqueeze", ["attention_mask", "o1"], ["am1"]),
        h.make_node("Unsqueeze", ["am1", "o1"], ["am2"]),
        h.make_node("Cast", ["am2"], ["amf"], to=TP.FLOAT),
        h.make_node("Sub", ["one_f", "amf"], ["inv"]),
        h.make_node("Mul", ["inv", "minf"], ["ext_mask"]),
        # q/k.view(bsz, seq, heads, head_dim) with the shape computed from the tensor
        h.make_node("MatMul", ["emb", "wq"], ["q0"]),
        h.make_node("MatMul", ["emb", "wk"], ["k0"]),
        h.make_node("Shape", ["q0"], ["qs"]),
        h.make_node("Slice", ["qs", "z1", "m1"], ["qs_head"]),
        h.make_node("Concat", ["qs_head", "heads", "hd"], ["qshape"], axis=0),
        h.make_node("Reshape", ["q0", "qshape"], ["q1"]),
        h.make_node("Reshape", ["k0", "qshape"], ["k1"]),
        h.make_node("Transpose", ["q1"], ["q"], perm=[0, 2, 1, 3]),
        h.make_node("Transpose", ["k1"], ["kt"], perm=[0, 2, 3, 1]),
        h.make_node("MatMul", ["q", "kt"], ["scores0"]),
        h.make_node("Add", ["scores0", "ext_mask"], ["scores"]),
        h.make_node("Softmax", ["scores"], ["probs"], axis=-1),
    ]
    graph = h.make_graph(nodes, "tiny_bert",
                         [h.make_tensor_value_info("input_ids", TP.INT64, ["batch", "seq"]),
                          h.make_tensor_value_info("attention_mask", TP.INT64, ["batch", "seq"])],
                         [h.make_tensor_value_info("probs", TP.FLOAT, ["batch", HEADS, "seq", "seq"])], inits)
    model = h.make_model(graph, opset_imports=[h.make_opsetid("", 17)])
    onnx.checker.check_model(model)
    return model


def reference(ids: np.ndarray, mask: np.ndarray) -> np.ndarray:
    """The layer in numpy."""
    w = weights()
    emb = w["word_emb"][ids] + w["pos_emb"][np.arange(S)][None] + w["type_emb"][0]
    ext = (1.0 - mask[:, None, None, :].astype(np.float32)) * -10000.0
    q = (emb @ w["wq"]).reshape(B, S, HEADS, H // HEADS).transpose(0, 2, 1, 3)
    kt = (emb @ w["wk"]).reshape(B, S, HEADS, H // HEADS).transpose(0, 2, 3, 1)
    scores = q @ kt + ext
    e = np.exp(scores - scores.max(-1, keepdims=True))
    return e / e.sum(-1, keepdims=True)


def inputs() -> tuple[np.ndarray, np.ndarray]:
    ids = np.random.default_rng(1).integers(0, VOCAB, (B, S)).astype(np.int64)
    mask = np.ones((B, S), np.int64)
    mask[1, 5:] = 0
    return ids, mask


def test_tvm_importer_fails_on_the_unfolded_export():
    from tvm.relax.frontend.onnx import from_onnx
    with pytest.raises(Exception):
        from_onnx(transformer_onnx(), shape_dict={"input_ids": [B, S], "attention_mask": [B, S]},
                  dtype_dict={"input_ids": "int64", "attention_mask": "int64"}, keep_params_in_input=True)


def test_folding_reports_what_it_did():
    folded, report = fold_shape_subgraphs(transformer_onnx(), {"input_ids": (B, S), "attention_mask": (B, S)})
    assert {"Shape", "ConstantOfShape", "Concat", "Where"} <= set(report.folded)
    assert "folded" in str(report) and "input_ids[2, 8]" in str(report)
    ops = [n.op_type for n in folded.graph.node]
    assert "Shape" not in ops and "ConstantOfShape" not in ops
    assert ops.count("MatMul") == 3 and "Softmax" in ops  # the real work stays
    dims = [d.dim_value for d in folded.graph.input[0].type.tensor_type.shape.dim]
    assert dims == [B, S]
    onnx.checker.check_model(folded)


def test_folded_model_equals_the_original_in_onnxruntime():
    ort = pytest.importorskip("onnxruntime", reason="onnxruntime is an optional cross-check")
    model = transformer_onnx()
    folded, _ = fold_shape_subgraphs(model, {"input_ids": (B, S), "attention_mask": (B, S)})
    ids, mask = inputs()
    feed = {"input_ids": ids, "attention_mask": mask}
    want = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, feed)[0]
    got = ort.InferenceSession(folded.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, feed)[0]
    np.testing.assert_array_equal(got, want)
    np.testing.assert_allclose(want, reference(ids, mask), rtol=1e-5, atol=1e-6)


def test_exported_transformer_loads_extracts_and_matches_numpy(tmp_path):
    path = tmp_path / "tiny_bert.onnx"
    onnx.save(transformer_onnx(), str(path))
    net = load_onnx(path, shapes={"input_ids": (B, S), "attention_mask": (B, S)})
    assert [s.name for s in net.inputs] == ["input_ids", "attention_mask"]
    ex = extract(net, TARGET)
    assert any("matmul" in t.name for t in ex.tasks)
    ids, mask = inputs()
    out = run(build(net.mod, TARGET, fused=False), net, [ids, mask], TARGET)
    np.testing.assert_allclose(out[0], reference(ids, mask), rtol=1e-4, atol=1e-5)


def test_torch_export_with_dynamic_axes_matches_torch(tmp_path):
    """A BERT-style layer written the way Hugging Face writes it, exported by torch.onnx with dynamic axes."""
    torch = pytest.importorskip("torch", reason="torch is optional (pip install 'ansor[torch]')")
    import math
    import warnings

    class Layer(torch.nn.Module):
        def __init__(self, hidden=32, heads=4):
            super().__init__()
            self.word, self.pos = torch.nn.Embedding(100, hidden), torch.nn.Embedding(64, hidden)
            self.register_buffer("position_ids", torch.arange(64).expand((1, -1)), persistent=False)
            self.qkv = torch.nn.ModuleList(torch.nn.Linear(hidden, hidden) for _ in range(3))
            self.heads, self.head_dim = heads, hidden // heads

        def split(self, x):
            return x.view(x.size()[:-1] + (self.heads, self.head_dim)).permute(0, 2, 1, 3)

        def forward(self, input_ids, attention_mask):
            batch, seq = input_ids.size()
            x = self.word(input_ids) + self.pos(self.position_ids[:, :seq])
            mask = attention_mask[:, None, None, :].expand(batch, 1, seq, seq).to(x.dtype)
            mask = (1.0 - mask).masked_fill((1.0 - mask).to(torch.bool), torch.finfo(x.dtype).min)
            q, k, v = (self.split(f(x)) for f in self.qkv)
            probs = torch.softmax(q @ k.transpose(-1, -2) / math.sqrt(self.head_dim) + mask, dim=-1)
            context = (probs @ v).permute(0, 2, 1, 3).contiguous()
            return context.view(context.size()[:-2] + (self.heads * self.head_dim,))

    torch.manual_seed(0)
    layer = Layer().eval()
    ids, mask = torch.randint(0, 100, (2, 16)), torch.ones(2, 16, dtype=torch.int64)
    mask[1, 10:] = 0
    path = tmp_path / "layer.onnx"
    dynamic = {0: "batch", 1: "seq"}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the TorchScript exporter is deprecated in favour of torch.export's
        torch.onnx.export(layer, (ids, mask), str(path), input_names=["input_ids", "attention_mask"],
                          opset_version=17, dynamo=False,
                          dynamic_axes={"input_ids": dynamic, "attention_mask": dynamic})
    net = load_onnx(path, shapes={"input_ids": (2, 16), "attention_mask": (2, 16)})
    out = run(build(net.mod, TARGET, fused=False), net, [ids.numpy(), mask.numpy()], TARGET)
    with torch.no_grad():
        want = layer(ids, mask).numpy()
    np.testing.assert_allclose(out[0], want, rtol=1e-4, atol=1e-5)


def test_hugging_face_bert_export():
    torch = pytest.importorskip("torch", reason="exporting real BERT needs torch (optional, not in the test extra)")
    transformers = pytest.importorskip("transformers",
                                       reason="exporting real BERT needs transformers (not a dependency)")
    import tempfile
    from pathlib import Path

    model = transformers.BertModel(transformers.BertConfig(num_hidden_layers=2)).eval()
    ids = torch.randint(0, 100, (1, 16))
    mask = torch.ones(1, 16, dtype=torch.int64)
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "bert.onnx"
        torch.onnx.export(model, (ids, mask), str(path), input_names=["input_ids", "attention_mask"], opset_version=17)
        net = load_onnx(path)
        out = run(build(net.mod, TARGET, fused=False), net, [ids.numpy(), mask.numpy()], TARGET)
    want = model(ids, attention_mask=mask).last_hidden_state.detach().numpy()
    np.testing.assert_allclose(out[0], want, rtol=1e-3, atol=1e-3)
