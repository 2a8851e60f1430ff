"""torch scaled_dot_product_attention (math, flash, efficient, cuDNN)."""
