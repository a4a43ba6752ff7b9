"""The autoregressive forecast from one init time, assembled exactly as training does.

Lead k+1 feeds the model the newest `history_len` state frames, the forcing at the predicted
time and the static fields (`credit.models.model_input`); its prognostic channels
become the newest frame of lead k+2. Forcing, static fields and truth come from the dataset
sample that starts k steps after the init's first input frame: its forcing frame
`history_len` is the predicted time, its target the truth at that time.
"""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np
import torch
from omegaconf import DictConfig
from torch import nn

from credit.data import ERA5Dataset, variable_spec
from credit.data.from_config import credit_gen1_dataset, credit_gen2_dataset
from credit.data.target_statistics import as_fields
from credit.models.dropout import dropout_step
from credit.models.inputs import predict
from credit.rollout.errors import RolloutError


def rollout_dataset(data: DictConfig, inits: list[int], step: int, lead_steps: int) -> ERA5Dataset:
    """One-step samples covering every input, forcing and truth time of `inits`."""
    first = min(inits) - (data.history_len - 1) * step
    last = max(inits) + lead_steps * step
    iso = [str(np.datetime64(int(t), "ns").astype("datetime64[s]")) for t in (first, last)]
    if data.layout == "credit-gen2":
        return credit_gen2_dataset(data, (iso[0], iso[1]), forecast_len=1)
    if data.layout == "credit-gen1":
        if data.credit.skip_periods != 1:
            raise RolloutError(f"data.credit.skip_periods={data.credit.skip_periods}: forecasts step one file "
                               "step at a time from consecutive input frames (skip_periods 1)")
        return credit_gen1_dataset(data, (iso[0], iso[1]), forecast_len=1)
    return ERA5Dataset(
        data.root,
        files=dict(data.files),
        variables=variable_spec(data),
        levels=list(data.levels),
        period=(iso[0], iso[1]),
        history_len=data.history_len,
        forecast_len=1,
        normalize=data.normalize,
        level_dim=data.level_dim,
    )


class Forecaster:
    """Runs `model` forward from init times of `dataset` (samples with forecast_len=1)."""

    def __init__(self, model: nn.Module, dataset: ERA5Dataset, device: torch.device, seed: int = 0) -> None:
        self.model, self.dataset, self.device, self.seed = model, dataset, device, seed
        self.history_len = dataset.history_len
        self.state_channels = len(dataset.state_channel_names)
        self.step = dataset.step_ns
        self._index = {int(t): i for i, t in enumerate(dataset.times.astype(np.int64))}
        mean, std = as_fields(dataset.target_mean), as_fields(dataset.target_std)
        self._mean = mean if dataset.normalize else np.zeros((len(mean), 1, 1))
        self._std = std if dataset.normalize else np.ones((len(std), 1, 1))
        self._inverse = dataset.output_inverse  # CREDIT's exp/square postblocks, or None

    def _sample(self, first_input_time: int) -> dict[str, torch.Tensor]:
        if first_input_time not in self._index:  # CREDIT's layout: a sample stays in its yearly file
            when = np.datetime64(int(first_input_time), "ns").astype("datetime64[m]")
            raise RolloutError(f"no sample of the data starts at {when}: with CREDIT's yearly files a "
                               "forecast's inputs and truth lie in one year's file; end it before the year ends")
        return self.dataset[self._index[first_input_time]]

    def physical(self, normalized: torch.Tensor) -> np.ndarray:
        """(C, H, W) normalized channels (target order, or its state prefix) -> physical float64."""
        values = normalized.detach().double().cpu().numpy()
        physical = values * self._std[: len(values)] + self._mean[: len(values)]
        if self._inverse is None:
            return physical
        full = np.zeros((len(self._mean), *physical.shape[1:]))  # the inverse indexes target channels
        full[: len(physical)] = physical
        return self._inverse(torch.from_numpy(full)).numpy()[: len(physical)]

    def persistence(self, init: int) -> np.ndarray:
        """(C_state, H, W) physical state at the init time: the persistence forecast."""
        first = init - (self.history_len - 1) * self.step
        return self.physical(self._sample(first)["state"][-1])

    @torch.no_grad()
    def leads(self, init: int, lead_steps: int, members: int = 1) -> Iterator[tuple[np.ndarray, np.ndarray]]:
        """(prediction, truth) per lead: (members, C_target, H, W) and (C_target, H, W),
        physical float64. The members start from the same state; a noise-injecting model's
        noise is keyed on (init time in seconds, lead, member)."""
        was_training = self.model.training
        self.model.eval()
        first = init - (self.history_len - 1) * self.step
        sample = self._sample(first)
        state = sample["state"].unsqueeze(0).to(self.device).repeat_interleave(members, 0)
        initial_state = state  # CREDIT's outside-model mass fixer conserves the initial state's mass
        static = sample["static"].unsqueeze(0).to(self.device).repeat_interleave(members, 0)
        try:
            for k in range(lead_steps):
                sample = sample if k == 0 else self._sample(first + k * self.step)
                forcing = sample["forcing"][: self.history_len + 1].unsqueeze(0).to(self.device)
                with dropout_step(self.seed, int(init) // 1_000_000_000 * 4096 + k, 0, members):
                    prediction = predict(self.model, state, forcing.repeat_interleave(members, 0), static,
                                         initial_state).float()
                newest = prediction[:, : self.state_channels].unsqueeze(1)
                state = torch.cat([state[:, 1:], newest], dim=1)
                yield np.stack([self.physical(p) for p in prediction]), self.physical(sample["target"][0])
        finally:
            self.model.train(was_training)
