##
## ch3:rch - see mpich/README.md in the rdma-channel repository.
##

include $(top_srcdir)/src/mpid/ch3/channels/rch/src/Makefile.mk

if BUILD_CH3_RCH

AM_CPPFLAGS +=                                          \
    -I$(top_srcdir)/src/mpid/ch3/channels/rch/include   \
    -I$(top_builddir)/src/mpid/ch3/channels/rch/include

noinst_HEADERS +=                                       \
    src/mpid/ch3/channels/rch/include/mpidi_ch3_pre.h   \
    src/mpid/ch3/channels/rch/include/mpidi_ch3_impl.h  \
    src/mpid/ch3/channels/rch/include/mpidi_ch3_post.h

endif BUILD_CH3_RCH
