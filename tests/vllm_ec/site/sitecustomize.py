"""On PYTHONPATH of the vLLM server processes the tests start: counts vision-encoder calls."""

import os

if os.environ.get("VISIONCACHE_TEST_ENCODER_LOG"):
    from tests.vllm_ec.encoder_counter import install_on_import

    install_on_import()
