"""Repository-wide pytest configuration.

nbval compares every text output of every chapter notebook. Glued figures and
images are binary and differ by matplotlib version, so they are skipped here
(nbval's documented ``skip_compare`` hook); glued *numbers* are text and are
compared.
"""
import os

os.environ.setdefault("PYDEVD_DISABLE_FILE_VALIDATION", "1")


def pytest_collectstart(collector):
    if collector.fspath and collector.fspath.ext == ".ipynb":
        collector.skip_compare += (
            "image/png",
            "image/jpeg",
            "image/svg+xml",
            "application/pdf",
            "text/html",
            "application/papermill.record/image/png",
            "application/papermill.record/text/html",
            "application/vnd.jupyter.widget-view+json",
        )
