"""Engine-side state: requests, the KV block pool and its manager, and the scheduler."""
