"""The shared gRPC layer: servers with health, reflection, auth and TLS; clients with deadlines."""
