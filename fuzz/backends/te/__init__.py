"""TransformerEngine DotProductAttention forced to one kernel: the adapter, kernel selection and the repro writer."""
