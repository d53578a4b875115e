"""A model that is not one of stoker's built-ins: `model.arch: own_model.denoiser:build`."""
