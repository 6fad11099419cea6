"""GENERATED protobuf and gRPC code for protos/t1/v1 -- do not edit.

Regenerate with `python -m t1.rpc.protogen`; tests/test_protos.py fails when this folder drifts.
"""
