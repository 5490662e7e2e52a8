"""The servers of one `--engine sglang` cell: one SGLang server, or N behind sglang-router.

`Fleet.start` starts every worker (each on a free port, its log `server.log` or
`server-<i>.log` in the run directory) and waits for each to be healthy, then, for a cluster,
sglang-router over them (`router.log`) and waits until it has registered all of them
(`router.wait_registered`, which gives the registry order). The client talks to `url` (the
router, or the one server) and tokenizes at `tokenize_url` (a worker: the router has no
`/tokenize`). `dead()` names a process that died, for the runner to restart; `stop()` stops
the router first, then the workers, each by its pid.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from topas_bench.runners.sglang.launcher import Server


@dataclass
class Fleet:
    workers: list[Server]
    router: Server | None = None
    #: the workers' URLs in the router's registry order (its tie-break order)
    order: list[str] = field(default_factory=list)

    @property
    def url(self) -> str:
        return self.router.url if self.router is not None else self.workers[0].url

    @property
    def tokenize_url(self) -> str:
        return self.workers[0].url

    @property
    def restarts(self) -> int:
        return sum(s.restarts for s in self.servers())

    def servers(self) -> list[Server]:
        return [*self.workers, *([self.router] if self.router is not None else [])]

    def start(self, health_timeout_s: float) -> None:
        from topas_bench.runners.sglang.router import wait_registered

        for w in self.workers:
            w.start()
        for w in self.workers:
            w.wait_healthy(health_timeout_s)
        if self.router is not None:
            self.router.start()
            self.order = wait_registered(
                self.router, [w.url for w in self.workers], health_timeout_s
            )

    def dead(self) -> Server | None:
        return next((s for s in self.servers() if not s.alive()), None)

    def restart(self, server: Server, health_timeout_s: float) -> None:
        from topas_bench.runners.sglang.router import wait_registered

        if server is self.router:
            server.stop()
            server.restarts += 1
            server.start()
            self.order = wait_registered(server, [w.url for w in self.workers], health_timeout_s)
        else:
            server.restart(health_timeout_s)

    def stop(self) -> None:
        for s in reversed(self.servers()):
            s.stop()

    def replica(self, url: str) -> int:
        """The replica index (position in `workers`) serving at `url`, or -1."""
        for i, w in enumerate(self.workers):
            if w.url == url.rstrip("/"):
                return i
        return -1
