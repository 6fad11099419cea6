"""The trajectory record: what one episode gives the trainer, and its msgpack serialization (serialization.py).

Modules:
- types.py: Trajectory, Segment, Turn, EpisodeStatus
- serialization.py: the msgpack codec: the bytes the spool stores and the trainer stream carries (CodecError)
- spool_files.py: the spool's files: length-prefixed, CRC-checked frames in segment files, and the ack log
- offload.py: one worker thread for the heavy pure work at an episode's end
"""
