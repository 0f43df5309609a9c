"""DeepSeek-V3's architecture (Transformers' ``DeepseekV3ForCausalLM``), GigaChat 3's: one folder.

config.py (data: the ``model:`` section, presets, axis rules), model.py (the decoder: multi-head latent attention,
dense first layers, then DeepSeek-style mixtures of experts), flops.py (hand-counted FLOPs by active parameters,
the parameter count), hf.py (the ``DeepseekV3ForCausalLM`` adapter), family.py (the registration). Importing the
package itself loads nothing: config load imports ``model.deepseek_v3.config``, which must stay free of jax.
"""
