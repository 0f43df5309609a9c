"""Gemma 3 (text): one folder.

config.py (data: the ``model:`` section, presets, axis rules), model.py (the decoder: local and global
attention layers, run as a scan over the repeating layer group), flops.py (hand-counted FLOPs), hf.py
(the ``Gemma3ForCausalLM`` adapter), family.py (the registration). Importing the package itself loads
nothing: config load imports ``model.gemma3.config``, which must stay free of jax.
"""
