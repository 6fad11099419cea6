"""T1's exception tree: every error T1 raises on purpose derives from `T1Error`.

The classes live beside the code that raises them (the module in brackets); this module holds
the bases and draws the tree. A class also keeps the builtin base it always had (ValueError,
RuntimeError, LookupError), so `except ValueError` around a parser still catches its errors.

    T1Error
    ├── InfraError                   the machinery around the policy failed: an episode that raises one
    │   │                            ends as infra_error (t1.agent.episode), never as a reward; whose fault
    │   │                            it is once the agent acted is t1.tasks.verify.outcome.attempt_failure's call
    │   ├── SandboxLost              [sandbox.types] a sandbox or its connection is gone
    │   │   ├── SandboxHostLost      [sandbox.types] lost with T1's process serving it (the sandbox service): T1's fault
    │   │   └── SandboxGone          [sandbox.types] a recorded sandbox cannot be reattached
    │   ├── SandboxCreateError       [sandbox.ssh.remote] a provider's create failed
    │   ├── NoFreeHost               [sandbox.ssh.remote] every host of an SSH inventory is busy
    │   ├── NetworkSetupError        [sandbox.isolation.netns] a sandbox's network namespace could not be made
    │   ├── LoopbackPortError        [sandbox.loopback_port] no port on a sandbox's own loopback
    │   ├── ServiceFailed            [sandbox.local.service_client] the local sandbox service cannot be started/reached
    │   ├── NeedsError               [sandbox.needs] the task needs what this host or provider cannot give
    │   │   ├── NeedsImageError
    │   │   ├── NeedsNetworkError
    │   │   └── NeedsFeatureError
    │   ├── SetupError               [tasks.transfer] preparing the sandbox for the task failed
    │   ├── T1Fault                  [tasks.verify.outcome] positively not the attempt's fault, even after it acted
    │   │   ├── InferenceFailed      [agent.episode_types] generation failed on every try
    │   │   └── VerifierEnvironmentError  [tasks.verify.separate] the separate verifier's environment did not build
    │   ├── InferenceUnavailable     [inference.client.pool_common] no replica answered within the retries
    │   │   └── EndpointUnavailable  [inference.openai.openai_pool]
    │   ├── EndpointRefused          [inference.openai.openai_wire] an endpoint refused for good (auth, 4xx)
    │   ├── MalformedReply           [inference.openai.openai_wire] a reply that breaks the API
    │   ├── NoTokenIds               [inference.openai.openai_wire] a completions reply without token ids
    │   └── GatewayInferenceFailed   [gateway.session] a harness's call found no inference
    ├── BadRequest                   what a caller asked for or handed in is wrong; the message names it
    │   ├── RequestError             [rpc.errors] a request field (INVALID_ARGUMENT)
    │   ├── NotFound                 [rpc.errors] (NOT_FOUND)
    │   ├── FailedPrecondition       [rpc.errors] state the server lacks (FAILED_PRECONDITION)
    │   │   └── BaseUnknown          [inference.prompt_delta] a prompt delta's base is not held here
    │   ├── ResourceExhausted        [rpc.errors] a bound on what the server holds (RESOURCE_EXHAUSTED)
    │   ├── TensorError              [rpc.tensors] a tensor on the wire
    │   ├── UnprotectedServer        [rpc.server] a server without auth asked to listen beyond loopback
    │   ├── ConfigError              [config.loader] a config file or override, by key path
    │   ├── TaskParseError           [tasks.spec] a task folder
    │   ├── BadCall                  [gateway.call] a harness's chat call
    │   └── RunDirError              [coordinator.run.run_dirs] the run-again rule cannot be followed
    ├── StorageError                 [here; workdir re-exports it] a process's on-disk state cannot be used
    │   └── DirectoryBusy            [workdir] another live process owns the directory
    ├── DataError                    a record that does not decode or does not fit what reads it
    │   ├── CodecError               [trajectory.serialization] a trajectory record
    │   ├── SpoolCorrupt             [trajectory.spool_files] a damaged spool frame
    │   ├── JournalMismatch          [tito.replay] a journal that does not rebuild its buffer
    │   ├── NotResumable             [agent.resume_point] a journal with no point to continue from
    │   ├── RoutingError             [routing.validation] a routing array
    │   └── RewardFileError          [tasks.verify.report] a verifier's reward file
    ├── ChildFailed                  [coordinator.local.children] a child service of the local run exited
    └── BackgroundFailed             [coordinator.run.parts] a background loop of the coordinator died

Private control-flow exceptions (a leading underscore) are not errors and stay outside the tree.
tests/test_errors.py fails when an exception class under t1/ does not derive from T1Error or is
missing from the drawing above.
"""

from __future__ import annotations


class T1Error(Exception):
    """Every error T1 raises on purpose."""


class InfraError(T1Error):
    """The machinery around the policy failed (sandbox, setup, needs, inference): never a reward."""


class BadRequest(T1Error):
    """What a caller asked for or handed in is wrong; str(self) names the field, key or file."""


class StorageError(T1Error, RuntimeError):
    """A file of a process's state cannot be opened or read; str(self) names the file and what to do."""


class DataError(T1Error):
    """A record does not decode, or does not fit what reads it; str(self) names the record."""
