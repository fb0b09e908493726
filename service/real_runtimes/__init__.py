"""The real third-party runtimes, for ``make real-runtimes`` (docs/runtimes.md)::

    catalog.py            runtimes.json: RuntimeEntry per kind, load_catalog
    install.py            the installer: Layout, Installer, Recipe, install_all, main
    steps.py              timed, skippable steps; sdist downloads; cmake builds
    recipes.py            every program installed, in order
    llamacpp_recipe.py    llama-server: chat, embedding, rerank
    whispercpp_recipe.py  whisper-server: speech to text
    sdcpp_recipe.py       sd-server: diffusion
    vllm_recipe.py        vLLM's CPU wheel: chat
    piper_recipe.py       piper-tts's HTTP server: text to speech
    gguf_models.py        the tiny llama GGUF in its three roles
    whisper_model.py      a tiny whisper in ggml's .bin format, and a WAV to transcribe
    sd_model.py           a tiny SD1-family model (SDXS-512-DS shape) with TAESD, in GGUF
    hf_model.py           a tiny Hugging Face llama for vLLM, tokenizer included
    piper_model.py        a tiny piper voice: VITS exported to ONNX, with its config
    writer_cli.py         the model writers' shared command line (--out, --seed)
    launch.py             the command line: install | show | exec KIND
    __main__.py           python -m service.real_runtimes

The model writers import only the standard library at the top: they run in the
installer's tools environment or vLLM's, not in the daemon's.
"""
