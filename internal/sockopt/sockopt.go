// Package sockopt sets the TCP options the standard library does not name.
package sockopt

// TCPUserTimeout is TCP_USER_TIMEOUT from linux/tcp.h (syscall does not name it).
const TCPUserTimeout = 0x12
