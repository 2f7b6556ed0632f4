// The three-consumer-warpgroup build of the Hopper kernel (192-row CTAs, the serial consumer loop),
// compiled beside sm90_launch.cu into the product library: with VC_SM90_SPLIT=1 it instantiates the
// kernels that split_consumers (sm90_launch.cu) gives three warpgroups and exports its entry points
// with a _c3 suffix; the two-consumer build's vc_sm90_forward calls them.
#undef VC_SM90_CONSUMERS
#define VC_SM90_CONSUMERS 3
#include "sm90_launch.cu"
