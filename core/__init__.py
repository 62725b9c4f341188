"""crowdmix's shared core: what the app SDK and the daemons both need, and nothing else.

Params and their validation (``params``, ``basic``, ``histogram``), Bloom hashing
(``hashing``), the per-report privacy figures (``privacy``), the metric registry
(``registry``), the sealed-report format (``sealed``; the HPKE suites it names are
``hpke``, which loads ``cryptography``), Redis URLs (``redis_url``), the
``GetConfig`` answer a shuffler builds (``device_config``) and the daemons' log of a
failure that repeats (``log_limit``). It imports only the wire
(``crowdmix.protos``, for ``device_config``); ``crowdmix.client`` (what an app embeds)
and the daemons import it, never each other.
"""

from __future__ import annotations

__all__: list[str] = []
