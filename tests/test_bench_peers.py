"""The runtimes ansor is compared with (ansor/bench/peers.py): a runtime that fails on a model is reported
missing with its error, and OpenVINO's inputs are found by any of their names."""

import numpy as np
import pytest

from ansor.bench.peers import feed_name, onnxruntime_peer, openvino_peer


@pytest.mark.parametrize("peer", [onnxruntime_peer, openvino_peer])
def test_a_runtime_that_fails_on_a_model_is_reported_not_raised(tmp_path, peer):
    """A zoo run timed 8 models, then OpenVINO's KeyError on GPT-2 ended it: now a runtime's own failure is
    its row's reason, and the benchmark goes on."""
    model = tmp_path / "broken.onnx"
    model.write_bytes(b"\x08\x07 not a protobuf")
    result = peer(str(model), {"input": np.zeros((1, 3), "float32")}, 1, 1)
    assert result.missing and np.isnan(result.median_ms) and result.outputs is None
    assert result.missing.startswith(("failed: ", "pip install")) and "\n" not in result.missing


def test_openvino_inputs_are_matched_by_any_of_their_names():
    feed = {"input_ids": np.zeros((1, 8), "int64")}
    # GPT-2's port: OpenVINO's any_name picked the Reshape it merged the input with
    assert feed_name({"/net/Reshape_output_0", "input_ids"}, feed) == "input_ids"
    with pytest.raises(KeyError, match="no input named a or b .*input_ids"):
        feed_name({"b", "a"}, feed)
