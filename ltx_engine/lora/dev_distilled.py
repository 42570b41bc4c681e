"""The dev DiT with the pack's distilled LoRA fused at a recipe's strength.

Upstream's dev recipes never run the distilled checkpoint: `TI2VidTwoStagesPipeline` builds stage 2 from
the dev transformer with the user's LoRAs and the distilled LoRA (strength 1 by default), and
`TI2VidTwoStagesHQPipeline` fuses the distilled LoRA into both stages (0.25 in stage 1, 0.5 in stage 2,
its `--distilled-lora-strength-stage-1/2` defaults). `DevWithDistilled` is a pack seen that way: both
DiT names ("transformer", which stage-2 tasks load, and "transformer_dev", which guidance passes load)
resolve to the dev weights with the set the view below holds (the user's LoRAs) then the distilled
LoRA, summed and requantized once. Its registry key names the strength, so a worker keeps the stage-1
and stage-2 DiTs of an HQ render apart and warm.
"""

from __future__ import annotations

DIT_NAMES = ("transformer", "transformer_dev")


class DevWithDistilled:
    """`pack` (or a user-LoRA view over it) with its DiT the dev one plus the distilled LoRA at `strength`."""

    def __init__(self, pack, strength: float):
        self.pack, self.strength = pack, float(strength)

    def __getattr__(self, name: str):
        return getattr(self.pack, name)

    @property
    def key(self) -> str:
        return f"{self.pack.key}|dev+distilled@{self.strength:g}"

    def _distilled(self) -> tuple[str, float]:
        return (self.pack.layout.found["distilled_lora"].files[0], self.strength)

    def tensors(self, component: str, loras: tuple[tuple[str, float], ...] = ()) -> dict:
        if component in DIT_NAMES:
            return self.pack.tensors("transformer_dev", loras=(*loras, self._distilled()))
        return self.pack.tensors(component, loras=loras) if loras else self.pack.tensors(component)

    def file_label(self, component: str) -> str:
        return self.pack.file_label("transformer_dev" if component in DIT_NAMES else component)

    def stream_parts(self, component: str = "transformer", loras: tuple[tuple[str, float], ...] = ()) -> dict:
        name = "transformer_dev" if component in DIT_NAMES else component
        return self.pack.stream_parts(name, loras=(*loras, self._distilled()))


def dev_view(pack, params: dict):
    """The pack as a task with `distilled_lora_strength` sees it (else the pack itself)."""
    strength = params.get("distilled_lora_strength")
    return pack if strength is None else DevWithDistilled(pack, float(strength))
