"""The fabric worker's settings (``KARIOS_FABRIC_*``), one pydantic-settings class beside the
shared :class:`karios.common.settings.KariosSettings` (bus, database, secret key)."""

from __future__ import annotations

from pathlib import Path

from pydantic import Field
from pydantic_settings import BaseSettings, SettingsConfigDict

from karios.fabric_worker.rollout.node import RolloutOptions

DEFAULT_VNIS = "10000"  # VNI_START of the planner's range: one L2 VNI, the overlay exists
DEFAULT_FRR_LOG_FILE = "/var/log/frr/frr-{hostname}.log"


class FabricWorkerSettings(BaseSettings):
    """Worker-side rollout settings (``KARIOS_FABRIC_*``)."""

    model_config = SettingsConfigDict(env_prefix="KARIOS_FABRIC_", extra="ignore")

    ssh_key: Path | None = Field(None, description="SSH private key file used for every node (key auth)")
    vnis: str = Field(
        DEFAULT_VNIS,
        description="Comma-separated L2 VNIs configured on every node, e.g. '100,200' (empty: apply "
        "answers 422; the default is the first VNI of the plan's range)",
    )
    frr_log_file: str = Field(
        DEFAULT_FRR_LOG_FILE,
        description="FRR log file on the nodes; {hostname} is replaced by the node's hostname, so "
        "several FRR instances sharing a filesystem never write one file",
    )
    concurrency: int = Field(16, ge=1, description="Nodes worked on at once")
    strict: bool = Field(False, description="A node failure rolls every touched node back")
    connect_timeout: float = Field(10.0, gt=0)
    verify_timeout: float = Field(60.0, gt=0, description="Seconds for BGP Established + EVPN routes")
    postdeploy_settle: float = Field(
        20.0,
        gt=0,
        description="Seconds after BGP Established for a node's post-deploy overlay checks: every "
        "configured VNI up on the node and an IMET route from every VTEP already rolled out",
    )
    dataplane_probe: bool = Field(
        True,
        description="After the overlay checks, ping another rolled-out node's VXLAN bridge "
        "(IPv6 link-local) with DF at the overlay MTU; its time is said in node_ready",
    )
    preflight_timeout: float = Field(20.0, gt=0, description="Per-node preflight limit, seconds")
    progress_interval: float = Field(15.0, gt=0, description="Seconds between in_progress() acks")
    heartbeat_interval: float = Field(5.0, gt=0, description="Seconds between job lease renewals")
    lease: float = Field(
        30.0, gt=0, description="A running job whose replica has not renewed it for this long is taken over"
    )
    drift_interval: float = Field(
        300.0,
        ge=0,
        description="Seconds between drift rounds (a read-only verify of every node against the "
        "intent; one replica runs each round); 0 turns drift detection off",
    )
    drift_settle: float = Field(
        60.0,
        ge=0,
        description="Settle window after an apply or teardown ends, seconds: a node's BGP session, "
        "EVPN route and remote-VTEP findings are held (not reported) until its sessions "
        "re-establish or the window ends; 0 reports them at once",
    )
    ack_wait: float = Field(60.0, gt=0, description="Seconds before an unacked fabric command is redelivered")

    def vni_list(self) -> tuple[int, ...]:
        try:
            return tuple(int(v) for v in self.vnis.replace(" ", "").split(",") if v)
        except ValueError:
            raise ValueError(f"KARIOS_FABRIC_VNIS: not a list of integers: {self.vnis!r}") from None

    def options(self) -> RolloutOptions:
        return RolloutOptions(
            connect_timeout=self.connect_timeout,
            verify_timeout=self.verify_timeout,
            settle_timeout=self.postdeploy_settle,
            dataplane_probe=self.dataplane_probe,
        )

    @property
    def beat(self) -> float:
        """Seconds between lease renewals (and bus in_progress acks) of a running job."""
        return min(self.heartbeat_interval, self.progress_interval, self.lease / 3)
