"""The trajectory record: what one episode gives the trainer, and its msgpack serialization (serialization.py)."""
