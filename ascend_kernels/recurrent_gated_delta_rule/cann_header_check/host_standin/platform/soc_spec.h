// Stand-in for CANN's platform/soc_spec.h, which asc-devkit's
// platform_ascendc.h includes; nothing of it is used by the op_host sources.
