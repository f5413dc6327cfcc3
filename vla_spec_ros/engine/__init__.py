"""The inference engine: requests, scheduling, KV ring, speculation, model runner."""
