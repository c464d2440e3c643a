"""The encoder-path chooser (gpucache/embedding/choose.py): which load-time stages are tried,
each with its reason, and what the embedder says they came to."""

from __future__ import annotations

from gpucache.embedding.choose import plan


def tried(**overrides):
    options = dict(
        device_type="cpu",
        dtype_given=None,
        faster_dtype="bfloat16",
        lean=True,
        lean_supported=True,
        cuda_graphs=True,
    )
    options.update(overrides)
    return {stage.name: stage.tried for stage in plan(**options)}


def test_on_a_cpu_with_bf16_every_stage_but_graphs_is_tried():
    assert tried() == {"autocast": True, "lean": True, "single": True, "graphs": False}


def test_on_cuda_graphs_are_tried_with_the_lean_pass_only():
    assert tried(device_type="cuda", faster_dtype="float16")["graphs"] is True
    assert tried(device_type="cuda", faster_dtype="float16", lean=False)["graphs"] is False
    assert tried(device_type="cuda", faster_dtype="float16", cuda_graphs=False)["graphs"] is False


def test_a_dtype_asked_for_or_no_half_precision_means_no_autocast():
    assert tried(dtype_given="float32")["autocast"] is False
    assert tried(faster_dtype="float32")["autocast"] is False


def test_a_model_the_lean_pass_does_not_know_runs_its_own_pass():
    assert tried(lean_supported=False) == {"autocast": True, "lean": False, "single": False, "graphs": False}


def test_every_stage_says_why():
    for stage in plan(
        device_type="cpu",
        dtype_given="float32",
        faster_dtype="float32",
        lean=False,
        lean_supported=True,
        cuda_graphs=False,
    ):
        assert not stage.tried and stage.why


def test_the_embedder_reports_what_each_stage_came_to(real_embedder):
    path = dict(real_embedder.encoder_path.stages)
    assert set(path) == {"autocast", "lean", "single", "graphs"}
    assert path["graphs"].startswith("not tried: CUDA graphs need a CUDA device")
    assert path["lean"].startswith("kept" if real_embedder.uses_lean else "dropped")
    assert real_embedder.encoder_path.summary == real_embedder.path
