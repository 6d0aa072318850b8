"""Every notebook: accelerators and links as their vendors specify them, HBM capacity and bandwidth,
dense bf16 rate, dies and fabric, host and peer links (NVIDIA H100 datasheet, NVIDIA H200 datasheet,
and the others each entry names; KV Cache Memory Wall, 2026, Table 3).

Pure Python: the analytical model (``kvlab.theory``) reads these; ``kvlab.lab.hardware`` measures
the machine in front of the reader.
"""

from __future__ import annotations

from dataclasses import dataclass

from kvlab._checks import integer, positive


@dataclass(frozen=True)
class Accelerator:
    """Vendor figures for one accelerator package, used at face value (SI units).

    ``die_bytes_per_s`` is the bandwidth one die or stack reaches from its local HBM, and
    ``fabric_bytes_per_s`` the die-to-die link (None where the vendor does not disclose it).

    ``hbm_bytes`` is the vendor's marketed capacity read as decimal bytes (80 GB = 80e9), as the
    seeds compute. ``hbm_bytes_exposed`` is what the driver reports as total memory, where known
    (None otherwise): the marketed figures are binary-ish, so the two differ (see
    ``exposed_memory``). ``host_link`` is the ``LINKS`` key of the link to host memory (swap and
    offload cross it).
    """

    name: str
    hbm_bytes: float
    hbm_bytes_per_s: float
    bf16_flops: float
    dies: int
    die_bytes_per_s: float
    fabric_bytes_per_s: float | None
    source: str
    hbm_bytes_exposed: float | None = None
    host_link: str | None = None

    def __post_init__(self):
        for name in ("name", "source"):
            if not isinstance(getattr(self, name), str):
                raise TypeError(f"{name} must be a str, got {getattr(self, name)!r}")
        for name in ("hbm_bytes", "hbm_bytes_per_s", "bf16_flops", "die_bytes_per_s"):
            positive(name, getattr(self, name))
        for name in ("fabric_bytes_per_s", "hbm_bytes_exposed"):
            if getattr(self, name) is not None:
                positive(name, getattr(self, name))
        integer("dies", self.dies)
        if self.host_link is not None and (
            not isinstance(self.host_link, str) or self.host_link not in LINKS
        ):
            raise ValueError(
                f"host_link must be None or one of {', '.join(LINKS)}, got {self.host_link!r}"
            )

    @property
    def ridge_point(self) -> float:
        """FLOP per byte at which dense bf16 math and HBM reads take equal time."""
        return self.bf16_flops / self.hbm_bytes_per_s


@dataclass(frozen=True)
class Link:
    """An interconnect, by its rate in ONE direction (bytes/s, SI units).

    NVIDIA's datasheets quote both NVLink and PCIe as the total of the two directions (H100:
    "NVLink: 900 GB/s", "PCIe Gen5: 128 GB/s"); PCI-SIG 2019 gives PCIe's per-direction rate. A
    one-way copy (a swap-out, a KV fetch) gets only ``bytes_per_s_each_way``.
    """

    name: str
    bytes_per_s_each_way: float
    source: str

    def __post_init__(self):
        positive("bytes_per_s_each_way", self.bytes_per_s_each_way)

    @property
    def bytes_per_s_both_ways(self) -> float:
        return 2 * self.bytes_per_s_each_way


LINKS: dict[str, Link] = {
    "pcie3-x16": Link(
        "PCIe Gen3 x16", 16e9, "PCI-SIG: 8 GT/s x 16 lanes, about 16 GB/s per direction"
    ),
    "pcie4-x16": Link(
        "PCIe Gen4 x16", 32e9, "PCI-SIG: 16 GT/s x 16 lanes, about 32 GB/s per direction"
    ),
    "pcie5-x16": Link(
        "PCIe Gen5 x16",
        64e9,
        "PCI-SIG: 32 GT/s x 16 lanes, about 64 GB/s per direction (KV Cache Memory Wall, 2026,"
        " section 2.7)",
    ),
    "nvlink4": Link(
        "NVLink 4 (H100/H200)",
        450e9,
        "NVIDIA H100 datasheet: 900 GB/s total, i.e. 450 GB/s each way (the KV Cache Memory Wall,"
        " 2026, quotes the 900)",
    ),
}

# Total memory the driver reports (nvidia-smi "memory.total"), in MiB: the marketed "80 GB" and
# "141 GB" are rounded binary-ish capacities, not 80e9 and 141e9 bytes.
_MIB = 2**20
_EXPOSED = "nvidia-smi memory.total: {} MiB"

_H100 = (
    "NVIDIA H100 Tensor Core GPU datasheet (2023), as quoted in KV Cache Memory Wall, 2026, Table 3"
    " and section 1.1"
)
SPECS: dict[str, Accelerator] = {
    "h100-sxm": Accelerator(
        "NVIDIA H100 SXM",
        80e9,
        3.35e12,
        989.5e12,
        1,
        3.35e12,
        None,
        _H100 + "; " + _EXPOSED.format(81559),
        81559 * _MIB,
        "pcie5-x16",
    ),
    "h200": Accelerator(
        "NVIDIA H200 SXM",
        141e9,
        4.8e12,
        989.5e12,
        1,
        4.8e12,
        None,
        "NVIDIA H200 Tensor Core GPU datasheet (2024): 141 GB HBM3e at 4.8 TB/s; bf16 rate as the"
        " H100 SXM; " + _EXPOSED.format(143771),
        143771 * _MIB,
        "pcie5-x16",
    ),
    "b200": Accelerator(
        "NVIDIA B200",
        192e9,
        8.0e12,
        2250e12,
        2,
        4.0e12,
        10e12,
        "NVIDIA Blackwell B200 datasheet (2024), as quoted in KV Cache Memory Wall, 2026, Table 3"
        " and appendix B.3 (NV-HBI 10 TB/s)",
        host_link="pcie5-x16",
    ),
    "mi300x": Accelerator(
        "AMD Instinct MI300X",
        192e9,
        5.3e12,
        1307e12,
        8,
        0.66e12,
        None,
        "AMD Instinct MI300X datasheet (2024), as quoted in KV Cache Memory Wall, 2026, Table 3 and"
        " appendix B.3 (on-package fabric rate not disclosed)",
        host_link="pcie5-x16",
    ),
    "a100-80gb": Accelerator(
        "NVIDIA A100 80GB SXM",
        80e9,
        2.039e12,
        312e12,
        1,
        2.039e12,
        None,
        "NVIDIA A100 Tensor Core GPU datasheet (2021), SXM 80 GB: 2,039 GB/s, 312 TFLOP/s dense"
        " bf16",
        host_link="pcie4-x16",
    ),
    "l4": Accelerator(
        "NVIDIA L4",
        24e9,
        300e9,
        121e12,
        1,
        300e9,
        None,
        "NVIDIA L4 datasheet (2023): 24 GB GDDR6 at 300 GB/s, 121 TFLOP/s dense bf16 (242 with"
        " sparsity)",
        host_link="pcie4-x16",
    ),
    "t4": Accelerator(
        "NVIDIA T4",
        16e9,
        320e9,
        65e12,
        1,
        320e9,
        None,
        "NVIDIA T4 datasheet (2018): 16 GB GDDR6 at 320 GB/s; no bf16 units, 65 TFLOP/s is its fp16"
        " tensor rate",
        host_link="pcie3-x16",
    ),
}


def spec(key: str) -> Accelerator:
    """The ``SPECS`` entry for ``key``, with an error that lists the known keys."""
    return _look_up(SPECS, key, "key", "device")


def link(key: str) -> Link:
    """The ``LINKS`` entry for ``key``, with an error that lists the known keys."""
    return _look_up(LINKS, key, "key", "link")


def accelerator(hw) -> Accelerator:
    """``hw`` itself if it is an ``Accelerator``, else the ``SPECS`` entry of its key
    (``"b200"``)."""
    return _look_up(SPECS, hw, "hw", "device", Accelerator)


def as_link(value) -> Link:
    """``value`` itself if it is a ``Link``, else the ``LINKS`` entry of its key
    (``"pcie5-x16"``)."""
    return _look_up(LINKS, value, "link", "link", Link)


def _look_up(table: dict, value, name: str, what: str, kind: type | None = None):
    """``value`` itself if it is a ``kind``, else ``table``'s entry for the key ``value``; an
    unknown key is a ValueError listing the known ones, anything else (with a ``kind``) a
    TypeError."""
    if kind is not None and isinstance(value, kind):
        return value
    if isinstance(value, str) and value in table:
        return table[value]
    article = "an" if kind is not None and kind.__name__[:1] in "AEIOU" else "a"
    allowed = (
        ("" if kind is None else f"{article} {kind.__name__} or ") + "one of " + ", ".join(table)
    )
    if kind is None or isinstance(value, str):
        raise ValueError(f"unknown {what} {value!r} ({name} must be {allowed})")
    raise TypeError(f"{name} must be {allowed}, got {type(value).__name__}")


def exposed_memory(hw) -> Accelerator:
    """``hw`` (an ``Accelerator`` or its ``SPECS`` key) with ``hbm_bytes`` set to the memory the
    driver reports instead of the decimal reading of the marketed figure: an H200 sold as 141 GB
    exposes about 140 GiB, about 150.8e9 bytes; an H100 80 GB about 79.6 GiB, 85.5e9 bytes.
    Every ``kvlab.theory.roofline`` function accepts the result in place of a datasheet's device.
    """
    import dataclasses

    hw = accelerator(hw)
    if hw.hbm_bytes_exposed is None:
        known = [k for k, a in SPECS.items() if a.hbm_bytes_exposed is not None]
        raise ValueError(
            f"the driver-reported memory of {hw.name} is not recorded; known for:"
            f" {', '.join(known)}"
        )
    return dataclasses.replace(hw, name=f"{hw.name} (as exposed)", hbm_bytes=hw.hbm_bytes_exposed)
