"""The real-model tier runs only when asked for (``-m realmodel``, as ``make test-realmodel``
does): its tests load SmolLM2-135M (pulled with ``zbrl models pull smollm2-135m``) and take
minutes on 2 cores, so a plain ``pytest tests`` skips them."""

import pytest


def pytest_collection_modifyitems(config, items):
    if "realmodel" in (config.option.markexpr or ""):
        return
    skip = pytest.mark.skip(reason="real-model tier: run `make test-realmodel` (-m realmodel)")
    for item in items:
        if "realmodel" in item.keywords:
            item.add_marker(skip)
