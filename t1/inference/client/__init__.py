"""The client side: the replica set both pools are, and `InferencePool` over T1's own gRPC servers.

- replicas.py: `ReplicaSet`: replicas over a `Transport` (one per replica), their health, least-outstanding
  placement, retries and failover, weight updates that skip avoided replicas and catch recovered ones up
  before routing to them, metrics.
- affinity.py: session affinity: the replica a session sticks to, and where a new one goes.
- kv_admission.py: admission by KV headroom: an episode starts only where a replica has room for what it
  will grow to.
- pool_common.py: what both pools share: PoolMetrics (and `observe`), WeightsUpdate, InferenceUnavailable.
- pool.py: `InferencePool`, the replica set over T1's gRPC servers, with prompt deltas; a GenerateFn.
- grpc_transport.py: one T1 inference server over gRPC: many requests over one stream, weight loads
  pushed or followed.
- stall.py: the stall watch: a replica that answers but completes no tokens while it has requests.
- stall_guard.py: its driver in the gRPC pool: probes busy replicas, fails a stalled one's sends over.
"""
