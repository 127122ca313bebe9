"""Tokenized datasets: their format as checkpoints (`index`), packing text into shards (`pack`),
and which shards a member trains on in a round (`assignment`)."""
