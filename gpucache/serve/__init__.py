"""``gpucache serve``: an OpenAI-compatible caching proxy in front of a self-hosted model
server (vLLM, SGLang, llama.cpp, TGI, Ollama). Needs the ``serve`` extra."""
