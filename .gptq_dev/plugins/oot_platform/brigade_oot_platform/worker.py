"""OotWorker: the example vendor's worker class, named by ``OotPlatform.worker_cls``."""

from __future__ import annotations

import logging

from brigade.worker.worker import Worker

logger = logging.getLogger(__name__)


class OotWorker(Worker):
    """The core Worker with the vendor's device set-up step; a real vendor binds its device here."""

    def init_device(self, hf_config) -> None:
        logger.info("oot worker rank %d: binding the oot device (host CPU)", self.rank)
        super().init_device(hf_config)
