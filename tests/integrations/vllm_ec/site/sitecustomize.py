"""On PYTHONPATH of the vLLM server processes the tests start: counts vision-encoder calls, and
slows disk-tier writes where a test asks (`tests.integrations.vllm_ec.slow_writes`)."""

import os

if os.environ.get("VISIONCACHE_TEST_ENCODER_LOG"):
    from tests.integrations.vllm_ec.encoder_counter import install_on_import

    install_on_import()

if os.environ.get("VISIONCACHE_TEST_SLOW_WRITES"):
    from tests.integrations.vllm_ec.slow_writes import install

    install()
