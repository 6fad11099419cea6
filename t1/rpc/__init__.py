"""The shared gRPC layer: servers with health, reflection, auth and TLS; clients with deadlines.

Modules:
- server.py: one server layer for every service: health, reflection, auth, TLS, graceful stop
- client.py: channels with named options, auth metadata, TLS and deadlines
- options.py: the named channel and server options
- auth.py: bearer-token auth: the server interceptor and client metadata
- guard.py: request bodies bounded and parsed before a servicer sees them
- errors.py: bad requests as status codes: INVALID_ARGUMENT, NOT_FOUND, FAILED_PRECONDITION,
  RESOURCE_EXHAUSTED
- tensors.py: numpy arrays and routing blocks <-> t1.v1.Tensor
- introspect.py: ask a running server for its health and its services (reflection)
- loop.py: run the main coroutine on uvloop where installed
- protogen.py: regenerate t1/v1 from protos/, and detect drift
"""
