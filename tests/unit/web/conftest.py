"""The web's unit tests' app: the real falcon app on a fake of the daemons
(``webfakes``), built once a module (a module with other settings defines its
own ``web``), its record of calls emptied before each test."""

from __future__ import annotations

import pytest
import webfakes
from webfakes import FakeDaemons, Served


@pytest.fixture(scope="module")
def web(tmp_path_factory) -> Served:
    return webfakes.served(tmp_path_factory.mktemp("web"))


@pytest.fixture
def daemons(web) -> FakeDaemons:
    return web.daemons.reset()


@pytest.fixture
def client(web, daemons):
    return web.client
