podman build --platform linux/arm64 --file ctx/images/runtime/Dockerfile --tag registry.example.com/gpuaccept-runtime:1 --build-arg GPUACCEPT_VERSION={version} --build-arg BASE_IMAGE=nvcr.io/nvidia/pytorch:25.01-py3 ctx
podman push registry.example.com/gpuaccept-runtime:1
