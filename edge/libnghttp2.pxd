"""libnghttp2's C API as :mod:`edge.h2_nghttp2` uses it (``nghttp2/nghttp2.h``
of libnghttp2-dev, 1.52 on Debian 12 with its security updates, which added
``nghttp2_option_set_stream_reset_rate_limit`` and
``nghttp2_option_set_max_continuations``)."""

from libc.stdint cimport int32_t, uint8_t, uint32_t, uint64_t

cdef extern from "nghttp2/nghttp2.h":
    ctypedef struct nghttp2_session:
        pass
    ctypedef struct nghttp2_session_callbacks:
        pass
    ctypedef struct nghttp2_option:
        pass
    ctypedef struct nghttp2_stream:
        pass

    ctypedef struct nghttp2_info:
        int age
        int version_num
        const char *version_str
        const char *proto_str

    ctypedef struct nghttp2_frame_hd:
        size_t length
        int32_t stream_id
        uint8_t type
        uint8_t flags
        uint8_t reserved

    ctypedef struct nghttp2_nv:
        uint8_t *name
        uint8_t *value
        size_t namelen
        size_t valuelen
        uint8_t flags

    ctypedef struct nghttp2_priority_spec:
        int32_t stream_id
        int32_t weight
        uint8_t exclusive

    ctypedef enum nghttp2_headers_category:
        NGHTTP2_HCAT_REQUEST
        NGHTTP2_HCAT_RESPONSE
        NGHTTP2_HCAT_PUSH_RESPONSE
        NGHTTP2_HCAT_HEADERS

    ctypedef struct nghttp2_data:
        nghttp2_frame_hd hd
        size_t padlen

    ctypedef struct nghttp2_headers:
        nghttp2_frame_hd hd
        size_t padlen
        nghttp2_priority_spec pri_spec
        nghttp2_nv *nva
        size_t nvlen
        nghttp2_headers_category cat

    ctypedef struct nghttp2_priority:
        nghttp2_frame_hd hd
        nghttp2_priority_spec pri_spec

    ctypedef struct nghttp2_rst_stream:
        nghttp2_frame_hd hd
        uint32_t error_code

    ctypedef struct nghttp2_settings_entry:
        int32_t settings_id
        uint32_t value

    ctypedef struct nghttp2_settings:
        nghttp2_frame_hd hd
        size_t niv
        nghttp2_settings_entry *iv

    ctypedef struct nghttp2_ping:
        nghttp2_frame_hd hd
        uint8_t opaque_data[8]

    ctypedef struct nghttp2_goaway:
        nghttp2_frame_hd hd
        int32_t last_stream_id
        uint32_t error_code
        uint8_t *opaque_data
        size_t opaque_data_len
        uint8_t reserved

    ctypedef struct nghttp2_window_update:
        nghttp2_frame_hd hd
        int32_t window_size_increment
        uint8_t reserved

    ctypedef union nghttp2_frame:
        nghttp2_frame_hd hd
        nghttp2_data data
        nghttp2_headers headers
        nghttp2_priority priority
        nghttp2_rst_stream rst_stream
        nghttp2_settings settings
        nghttp2_ping ping
        nghttp2_goaway goaway
        nghttp2_window_update window_update

    ctypedef union nghttp2_data_source:
        int fd
        void *ptr

    ctypedef ssize_t (*nghttp2_data_source_read_callback)(
        nghttp2_session *session, int32_t stream_id, uint8_t *buf, size_t length,
        uint32_t *data_flags, nghttp2_data_source *source, void *user_data)

    ctypedef struct nghttp2_data_provider:
        nghttp2_data_source source
        nghttp2_data_source_read_callback read_callback

    ctypedef int (*nghttp2_on_frame_recv_callback)(
        nghttp2_session *session, const nghttp2_frame *frame, void *user_data)
    ctypedef int (*nghttp2_on_frame_send_callback)(
        nghttp2_session *session, const nghttp2_frame *frame, void *user_data)
    ctypedef int (*nghttp2_on_begin_headers_callback)(
        nghttp2_session *session, const nghttp2_frame *frame, void *user_data)
    ctypedef int (*nghttp2_on_begin_frame_callback)(
        nghttp2_session *session, const nghttp2_frame_hd *hd, void *user_data)
    ctypedef int (*nghttp2_on_header_callback)(
        nghttp2_session *session, const nghttp2_frame *frame, const uint8_t *name,
        size_t namelen, const uint8_t *value, size_t valuelen, uint8_t flags,
        void *user_data)
    ctypedef int (*nghttp2_on_stream_close_callback)(
        nghttp2_session *session, int32_t stream_id, uint32_t error_code, void *user_data)
    ctypedef int (*nghttp2_on_data_chunk_recv_callback)(
        nghttp2_session *session, uint8_t flags, int32_t stream_id, const uint8_t *data,
        size_t len, void *user_data)
    ctypedef int (*nghttp2_error_callback2)(
        nghttp2_session *session, int lib_error_code, const char *msg, size_t len,
        void *user_data)

    int NGHTTP2_ERR_CALLBACK_FAILURE
    int NGHTTP2_ERR_PAUSE
    int NGHTTP2_ERR_BAD_CLIENT_MAGIC
    int NGHTTP2_ERR_TOO_MANY_CONTINUATIONS
    int NGHTTP2_ERR_FLOODED
    int NGHTTP2_ERR_NOMEM

    uint8_t NGHTTP2_FLAG_NONE
    uint8_t NGHTTP2_FLAG_END_STREAM
    uint8_t NGHTTP2_FLAG_END_HEADERS
    uint8_t NGHTTP2_FLAG_ACK
    uint8_t NGHTTP2_FLAG_PRIORITY
    uint8_t NGHTTP2_FLAG_PADDED
    uint8_t NGHTTP2_NV_FLAG_NONE
    uint8_t NGHTTP2_NV_FLAG_NO_INDEX
    uint32_t NGHTTP2_DATA_FLAG_EOF

    uint8_t NGHTTP2_DATA
    uint8_t NGHTTP2_HEADERS
    uint8_t NGHTTP2_PRIORITY
    uint8_t NGHTTP2_RST_STREAM
    uint8_t NGHTTP2_SETTINGS
    uint8_t NGHTTP2_PING
    uint8_t NGHTTP2_GOAWAY
    uint8_t NGHTTP2_WINDOW_UPDATE
    uint8_t NGHTTP2_CONTINUATION
    uint8_t NGHTTP2_PUSH_PROMISE

    int32_t NGHTTP2_SETTINGS_MAX_CONCURRENT_STREAMS
    int32_t NGHTTP2_SETTINGS_INITIAL_WINDOW_SIZE
    int32_t NGHTTP2_SETTINGS_MAX_FRAME_SIZE
    int32_t NGHTTP2_SETTINGS_MAX_HEADER_LIST_SIZE
    int32_t NGHTTP2_SETTINGS_ENABLE_CONNECT_PROTOCOL
    int32_t NGHTTP2_SETTINGS_NO_RFC7540_PRIORITIES

    uint32_t NGHTTP2_NO_ERROR
    uint32_t NGHTTP2_PROTOCOL_ERROR
    uint32_t NGHTTP2_STREAM_CLOSED
    uint32_t NGHTTP2_REFUSED_STREAM
    uint32_t NGHTTP2_ENHANCE_YOUR_CALM

    ctypedef enum nghttp2_stream_proto_state:
        NGHTTP2_STREAM_STATE_IDLE
        NGHTTP2_STREAM_STATE_OPEN
        NGHTTP2_STREAM_STATE_RESERVED_LOCAL
        NGHTTP2_STREAM_STATE_RESERVED_REMOTE
        NGHTTP2_STREAM_STATE_HALF_CLOSED_LOCAL
        NGHTTP2_STREAM_STATE_HALF_CLOSED_REMOTE
        NGHTTP2_STREAM_STATE_CLOSED

    nghttp2_info *nghttp2_version(int least_version)
    const char *nghttp2_strerror(int lib_error_code)

    int nghttp2_session_callbacks_new(nghttp2_session_callbacks **callbacks_ptr)
    void nghttp2_session_callbacks_del(nghttp2_session_callbacks *callbacks)
    void nghttp2_session_callbacks_set_on_frame_recv_callback(
        nghttp2_session_callbacks *cbs, nghttp2_on_frame_recv_callback cb)
    void nghttp2_session_callbacks_set_on_frame_send_callback(
        nghttp2_session_callbacks *cbs, nghttp2_on_frame_send_callback cb)
    void nghttp2_session_callbacks_set_on_begin_headers_callback(
        nghttp2_session_callbacks *cbs, nghttp2_on_begin_headers_callback cb)
    void nghttp2_session_callbacks_set_on_begin_frame_callback(
        nghttp2_session_callbacks *cbs, nghttp2_on_begin_frame_callback cb)
    void nghttp2_session_callbacks_set_on_header_callback(
        nghttp2_session_callbacks *cbs, nghttp2_on_header_callback cb)
    void nghttp2_session_callbacks_set_on_stream_close_callback(
        nghttp2_session_callbacks *cbs, nghttp2_on_stream_close_callback cb)
    void nghttp2_session_callbacks_set_on_data_chunk_recv_callback(
        nghttp2_session_callbacks *cbs, nghttp2_on_data_chunk_recv_callback cb)
    void nghttp2_session_callbacks_set_error_callback2(
        nghttp2_session_callbacks *cbs, nghttp2_error_callback2 cb)

    int nghttp2_option_new(nghttp2_option **option_ptr)
    void nghttp2_option_del(nghttp2_option *option)
    void nghttp2_option_set_no_http_messaging(nghttp2_option *option, int val)
    void nghttp2_option_set_no_auto_window_update(nghttp2_option *option, int val)
    void nghttp2_option_set_no_closed_streams(nghttp2_option *option, int val)
    void nghttp2_option_set_max_outbound_ack(nghttp2_option *option, size_t val)
    void nghttp2_option_set_max_settings(nghttp2_option *option, size_t val)
    void nghttp2_option_set_stream_reset_rate_limit(
        nghttp2_option *option, uint64_t burst, uint64_t rate)
    void nghttp2_option_set_max_continuations(nghttp2_option *option, size_t val)

    int nghttp2_session_server_new2(
        nghttp2_session **session_ptr, const nghttp2_session_callbacks *callbacks,
        void *user_data, const nghttp2_option *option)
    void nghttp2_session_del(nghttp2_session *session)
    ssize_t nghttp2_session_mem_recv(nghttp2_session *session, const uint8_t *data, size_t inlen)
    ssize_t nghttp2_session_mem_send(nghttp2_session *session, const uint8_t **data_ptr)

    int nghttp2_submit_settings(
        nghttp2_session *session, uint8_t flags, const nghttp2_settings_entry *iv, size_t niv)
    int nghttp2_submit_headers(
        nghttp2_session *session, uint8_t flags, int32_t stream_id,
        const nghttp2_priority_spec *pri_spec, const nghttp2_nv *nva, size_t nvlen,
        void *stream_user_data)
    int nghttp2_submit_data(
        nghttp2_session *session, uint8_t flags, int32_t stream_id,
        const nghttp2_data_provider *data_prd)
    int nghttp2_submit_rst_stream(
        nghttp2_session *session, uint8_t flags, int32_t stream_id, uint32_t error_code)
    int nghttp2_submit_window_update(
        nghttp2_session *session, uint8_t flags, int32_t stream_id,
        int32_t window_size_increment)
    int nghttp2_session_terminate_session2(
        nghttp2_session *session, int32_t last_stream_id, uint32_t error_code)
    int nghttp2_session_consume(nghttp2_session *session, int32_t stream_id, size_t size)

    nghttp2_stream *nghttp2_session_find_stream(nghttp2_session *session, int32_t stream_id)
    nghttp2_stream_proto_state nghttp2_stream_get_state(nghttp2_stream *stream)
    int32_t nghttp2_session_get_stream_remote_window_size(
        nghttp2_session *session, int32_t stream_id)
    int32_t nghttp2_session_get_remote_window_size(nghttp2_session *session)
    uint32_t nghttp2_session_get_remote_settings(nghttp2_session *session, int32_t id)
