"""Qwen3-MoE (Transformers' ``Qwen3MoeForCausalLM``): one folder.

config.py (data: the ``model:`` section, presets, axis rules), model.py (the decoder: Qwen3 attention and a
mixture-of-experts MLP in every layer, the router statistics carried out of the layer scan), flops.py
(hand-counted FLOPs by active parameters, the parameter count), hf.py (the ``Qwen3MoeForCausalLM`` adapter),
family.py (the registration). Importing the package itself loads nothing: config load imports
``model.qwen3_moe.config``, which must stay free of jax.
"""
