##
## ch3:rch - see mpich/README.md in the rdma-channel repository.
##

# Added unconditionally, like every channel's: the error-message table does not
# depend on configure's choices.
errnames_txt_files += src/mpid/ch3/channels/rch/src/errnames.txt

if BUILD_CH3_RCH

mpi_core_sources +=                                 \
    src/mpid/ch3/channels/rch/src/ch3_init.c        \
    src/mpid/ch3/channels/rch/src/ch3_vc.c          \
    src/mpid/ch3/channels/rch/src/ch3_send.c        \
    src/mpid/ch3/channels/rch/src/ch3_progress.c    \
    src/mpid/ch3/channels/rch/src/ch3_win_fns.c

endif BUILD_CH3_RCH
