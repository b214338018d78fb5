[#] start of __file__
dnl ch3:rch - the CH3 channel over rdma-channel (https://... see mpich/README.md in
dnl the rdma-channel repository). Selected with --with-device=ch3:rch; the library is
dnl found with --with-rch=PREFIX (or --with-rch-include / --with-rch-lib).

AC_DEFUN([PAC_SUBCFG_PREREQ_]PAC_SUBCFG_AUTO_SUFFIX,[
    AM_CONDITIONAL([BUILD_CH3_RCH],[test "X$device_name" = "Xch3" -a "X$channel_name" = "Xrch"])
    AM_COND_IF([BUILD_CH3_RCH],[
        AC_MSG_NOTICE([RUNNING PREREQ FOR ch3:rch])
        # Every MPI thread level: the channel serialises its own state under CH3's
        # global critical section and rdma-channel's calls are thread-safe.
        MPID_MAX_THREAD_LEVEL=MPI_THREAD_MULTIPLE
        MPID_CH3I_CH_HCOLL_BCOL="basesmuma,basesmuma,ptpcoll"
    ])
])dnl

AC_DEFUN([PAC_SUBCFG_BODY_]PAC_SUBCFG_AUTO_SUFFIX,[
AM_COND_IF([BUILD_CH3_RCH],[
    AC_MSG_NOTICE([RUNNING CONFIGURE FOR ch3:rch])
    PAC_SET_HEADER_LIB_PATH([rch])
    # A shared librdma_channel outside the loader's paths must still be found at run
    # time by libmpi and by every MPI program: record its directory as a run path.
    if test -n "${with_rch_lib}" ; then
        PAC_APPEND_FLAG([-Wl,-rpath,${with_rch_lib}],[LDFLAGS])
        PAC_APPEND_FLAG([-Wl,-rpath,${with_rch_lib}],[WRAPPER_LDFLAGS])
    elif test -n "${with_rch}" -a "X${with_rch}" != "Xyes" ; then
        PAC_APPEND_FLAG([-Wl,-rpath,${with_rch}/lib],[LDFLAGS])
        PAC_APPEND_FLAG([-Wl,-rpath,${with_rch}/lib],[WRAPPER_LDFLAGS])
    fi
    PAC_CHECK_HEADER_LIB([rch.h],[rdma_channel],[rch_init_process_group_external],
                         [rch_found=yes],[rch_found=no])
    if test "$rch_found" = "no" ; then
        AC_MSG_ERROR([ch3:rch needs rdma-channel's rch.h and librdma_channel; install them with scripts/install-c PREFIX from rdma-channel and pass --with-rch=PREFIX])
    fi
    AC_MSG_CHECKING([whether rch.h has rch_put_lend (interface 1.12)])
    AC_COMPILE_IFELSE([AC_LANG_PROGRAM([[#include <rch.h>]],
        [[#if RCH_VERSION_MAJOR != 1 || RCH_VERSION_MINOR < 12
          #error too old
          #endif
          int r, n;
          const void *b;
          size_t l;
          uint64_t t;
          rch_lane w;
          rch_send_lane *s = 0;
          return rch_wakeup() + rch_poll_ready(&r, 1, &n) + rch_peek(0, &b, &l, 0) +
                 rch_consume(0, 0) + rch_consume_peek_lane(0, 0, &b, &l, 0, &w) +
                 rch_lane_packet(&w, &b, &l) + rch_vc_send_lane(0, &s) + rch_lane_ring(0) +
                 rch_lane_send(s, b, l, 0, 0) + rch_wait_spins(&r) +
                 rch_copy_lent(0, &r, b, l) + rch_put_lend(0, 0, 0, &l, &t) +
                 rch_lends_released(0, &t);]])],
        [AC_MSG_RESULT([yes])],
        [AC_MSG_RESULT([no])
         AC_MSG_ERROR([ch3:rch needs rdma-channel's C interface 1.12 or later])])
    PAC_LIBS_ADD([-lrdma_channel])
])dnl end AM_COND_IF(BUILD_CH3_RCH,...)
])dnl end _BODY

[#] end of __file__
