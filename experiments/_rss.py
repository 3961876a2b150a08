"""Peak resident memory of a code region, by polling /proc/self/statm (stdlib only).

``ru_maxrss`` is a process-lifetime high-water mark that the imports (JAX, TensorFlow) may
already have set; polling measures the region itself: max RSS during it minus RSS before it.
"""

import os
import threading
import time

_PAGE = os.sysconf("SC_PAGE_SIZE")


def rss_mib() -> float:
    with open("/proc/self/statm") as fh:
        return int(fh.read().split()[1]) * _PAGE / 2**20


class PeakRSS:
    """``with PeakRSS() as m: ...``; then ``m.base_mib``, ``m.peak_mib`` (max during the block,
    polled every 2 ms) and ``m.delta_mib = peak − base``."""

    def __enter__(self):
        self.base_mib = self.peak_mib = rss_mib()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._poll, daemon=True)
        self._thread.start()
        return self

    def _poll(self):
        while not self._stop.is_set():
            self.peak_mib = max(self.peak_mib, rss_mib())
            time.sleep(0.002)

    def __exit__(self, *exc):
        self._stop.set()
        self._thread.join()
        self.peak_mib = max(self.peak_mib, rss_mib())
        self.delta_mib = self.peak_mib - self.base_mib
