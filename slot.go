package redisync

import "strings"

// slotOf returns the Redis Cluster hash slot of key: CRC16 (XMODEM) of
// the key's hash tag (the part between the first '{' and the next '}',
// when not empty) or of the whole key, modulo 16384.
func slotOf(key string) uint16 {
	if i := strings.IndexByte(key, '{'); i >= 0 {
		if j := strings.IndexByte(key[i+1:], '}'); j > 0 {
			key = key[i+1 : i+1+j]
		}
	}
	var crc uint16
	for k := 0; k < len(key); k++ {
		crc ^= uint16(key[k]) << 8
		for range 8 {
			if crc&0x8000 != 0 {
				crc = crc<<1 ^ 0x1021
			} else {
				crc <<= 1
			}
		}
	}
	return crc % 16384
}
