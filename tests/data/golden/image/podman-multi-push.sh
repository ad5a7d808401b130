podman manifest exists registry.example.com/gpuaccept-runtime:1 && podman manifest rm registry.example.com/gpuaccept-runtime:1
podman build --platform linux/amd64,linux/arm64 --file ctx/images/runtime/Dockerfile --manifest registry.example.com/gpuaccept-runtime:1 --build-arg GPUACCEPT_VERSION={version} --build-arg BASE_IMAGE=nvcr.io/nvidia/pytorch:25.01-py3 ctx
podman manifest push --all registry.example.com/gpuaccept-runtime:1 docker://registry.example.com/gpuaccept-runtime:1
