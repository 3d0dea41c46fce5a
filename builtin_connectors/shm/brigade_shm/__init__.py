"""brigade-shm: the ``SharedMemoryConnector`` KV connector, prefill/decode disaggregation on one host."""
