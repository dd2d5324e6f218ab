"""Weights of models trained elsewhere (insightface's arcface_torch, PLSC) as this project's backbones."""
