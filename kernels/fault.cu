// Fault injection (model::Fault::IllegalAddress): one thread writes to `address`, which the
// host picks outside every allocation (the device's null page), so that the stream meets
// CUDA's sticky illegal-address error as a faulty kernel would. Never launched otherwise.
extern "C" __global__ void KERNEL(fault_write)(unsigned int* address) {
    grid_dep_enter();
    *(volatile unsigned int*)address = 0xdeadu;
}
