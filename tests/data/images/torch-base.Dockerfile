# The image tests' stand-in for an NGC PyTorch image: Debian's python3 and pip, and a CPU torch
# installed system-wide from a wheel file that is not in the image afterwards (NGC's torch is
# installed the same way). The tests mount the wheel directory at /wheels while building.
ARG BASE_IMAGE=localhost/gpuaccept-test/debian:bookworm
FROM ${BASE_IMAGE}
RUN apt-get update \
 && DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends python3 python3-pip \
 && apt-get clean && rm -rf /var/lib/apt/lists/*
RUN python3 -m pip install --no-cache-dir --break-system-packages /wheels/torch-*.whl
