"""The generated code in t1/v1 must be exactly what protos/ generates."""

from __future__ import annotations

import shutil

from t1.rpc import protogen


def test_generated_code_matches_protos():
    assert protogen.drift() == [], "run `python -m t1.rpc.protogen` and commit t1/v1"


def test_drift_detects_an_edited_generated_file(tmp_path):
    repo = tmp_path / "repo"
    shutil.copytree(protogen.ROOT / "protos", repo / "protos")
    shutil.copytree(protogen.ROOT / "t1" / "v1", repo / "t1" / "v1")
    assert protogen.drift(repo) == []
    edited = repo / "t1" / "v1" / "inference_pb2.py"
    edited.write_text(edited.read_text() + "\n# hand edit\n")
    assert protogen.drift(repo) == ["inference_pb2.py"]


def test_drift_detects_a_proto_change_without_regeneration(tmp_path):
    repo = tmp_path / "repo"
    shutil.copytree(protogen.ROOT / "protos", repo / "protos")
    shutil.copytree(protogen.ROOT / "t1" / "v1", repo / "t1" / "v1")
    proto = repo / "protos" / "t1" / "v1" / "trainer.proto"
    proto.write_text(proto.read_text().replace("string tag = 1;", "string tag = 1;\n  bool force = 2;"))
    assert "trainer_pb2.py" in protogen.drift(repo)
