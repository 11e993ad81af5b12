"""Parts of `visioncache.integrations.vllm`'s encoder-cache connector that do not import vLLM:
its configuration, the namespace of its keys and the store its two halves share."""
