"""stable-diffusion.cpp's ``sd-server``, built from the sources the
stable-diffusion-cpp-python sdist vendors, serving a generated model (``sd_model``: a tiny
SD1-family UNet, CLIP-L and TAESD) for image generation."""

from __future__ import annotations

from service.real_runtimes.catalog import RuntimeEntry
from service.real_runtimes.install import LOCAL, SD_CPP_PYTHON, Installer, Layout, Recipe
from service.real_runtimes.steps import Step

MODEL = "sd-tiny-random"  # a directory: model.gguf and taesd.gguf
IMAGE_SIZE = "64x64"  # one step at this size takes under a second on 2 cores


def _steps(installer: Installer) -> list[Step]:
    src = installer.layout.src("stable-diffusion-cpp-python", SD_CPP_PYTHON)
    return [
        installer.sdist("stable-diffusion-cpp-python", SD_CPP_PYTHON),
        installer.cmake(
            "sd-server",
            lambda: src / "vendor" / "stable-diffusion.cpp",
            "-DSD_SERVER_BUILD_FRONTEND=OFF",
            "-DSD_WEBP=OFF",
            "-DSD_WEBM=OFF",
            "-DSD_BUILD_EXAMPLES=ON",
        ),
        installer.model("diffusion", "sd_model", installer.layout.models / MODEL),
    ]


def _entries(layout: Layout) -> dict[str, RuntimeEntry]:
    from service.real_runtimes.sd_model import MODEL_FILE, TAESD_FILE

    model = layout.models / MODEL
    command = (
        str(layout.binary("sd-server")),
        *("--model", str(model / MODEL_FILE), "--taesd", str(model / TAESD_FILE)),
        *("--listen-ip", LOCAL, "--listen-port", "${PORT}", "--threads", "2"),
        # The server's defaults for every request (a request's "size" and the JSON in its
        # prompt's <sd_cpp_extra_args> override them): 20 steps with classifier-free
        # guidance at 512x512 take minutes here; a random model draws noise either way.
        *("--steps", "1", "--cfg-scale", "1", "--width", "64", "--height", "64"),
    )
    return {
        "diffusion": RuntimeEntry(
            adapter="sd.cpp",
            command=command,
            model=str(model / MODEL_FILE),
            # sd-server prints "version unknown, commit unknown" when built from the sdist.
            version=f"stable-diffusion.cpp (stable-diffusion-cpp-python {SD_CPP_PYTHON})",
            routes=("/v1/images/generations", "/v1/images/edits"),
            image_size=IMAGE_SIZE,
        )
    }


RECIPE = Recipe("stable-diffusion.cpp", _steps, _entries)
