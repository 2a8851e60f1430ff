"""FlashInfer (serving kernels: single / batch prefill and decode over paged and ragged KV caches)."""
