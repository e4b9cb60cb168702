"""Logical axis names of parameters and their mapping onto the device mesh.

Every parameter is annotated with one logical name per dimension, e.g.
`nnx.Param(w, out_sharding=("embed", "mlp"))`. The rules below map logical
names onto the mesh axes `data`, `fsdp`, `tensor`; a name without a rule (or
`None`) is replicated.
"""

# Logical names used by the models.
EMBED = "embed"        # model (residual stream) width
MLP = "mlp"            # feed-forward hidden width
HEADS = "heads"        # query heads x head_dim, flattened
KV = "kv"              # key/value heads x head_dim, flattened
VOCAB = "vocab"        # output / input vocabulary
CONV_IN = "conv_in"    # convolution input channels
CONV_OUT = "conv_out"  # convolution output channels

# Default logical -> mesh axis rules (FSDP over the residual width, tensor
# parallelism over heads, MLP and vocabulary).
DEFAULT_RULES = (
    (EMBED, "fsdp"),
    (MLP, "tensor"),
    (HEADS, "tensor"),
    (KV, "tensor"),
    (VOCAB, "tensor"),
    (CONV_IN, None),
    (CONV_OUT, "fsdp"),
)
