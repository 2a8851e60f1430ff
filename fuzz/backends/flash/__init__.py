"""flash-attn FA2, FA3 and FA4: what they share (common), each adapter, and the repro writer."""
