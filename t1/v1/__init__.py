"""GENERATED protobuf and gRPC code for protos/t1/v1 -- do not edit.

Regenerate with `python -m t1.rpc.protogen`; tests/test_protos.py fails when this folder drifts.

- common_pb2.py, common_pb2_grpc.py: common.proto (Tensor, RoutingBlock).
- inference_pb2.py, inference_pb2_grpc.py: inference.proto (InferenceService).
- trainer_pb2.py, trainer_pb2_grpc.py: trainer.proto (TrainerService).
- coordinator_pb2.py, coordinator_pb2_grpc.py: coordinator.proto (CoordinatorService: eval jobs, run status).
"""
