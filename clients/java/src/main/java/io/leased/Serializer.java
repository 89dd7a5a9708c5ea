package io.leased;

/**
 * Turns cached values into the text leased stores and back. {@link #JSON}
 * (the default) takes what {@link Json} takes: a Map, a List, a number, a
 * String, a boolean; {@link #RAW} stores strings as they are, for keys
 * shared with {@code leasectl get}/{@code set} or clients that store plain
 * strings. A refusal is an IllegalArgumentException.
 */
public interface Serializer {
    String dumps(Object value);

    Object loads(String text);

    Serializer JSON = new Serializer() {
        @Override
        public String dumps(Object value) {
            if (value instanceof byte[]) {
                throw new IllegalArgumentException("bytes are not JSON: decode them, or pass a"
                        + " serializer that takes bytes");
            }
            return Json.encode(value);
        }

        @Override
        public Object loads(String text) {
            return Json.decode(text);
        }
    };

    Serializer RAW = new Serializer() {
        @Override
        public String dumps(Object value) {
            if (!(value instanceof String s)) {
                throw new IllegalArgumentException("the raw serializer caches strings only, not "
                        + Json.typeName(value));
            }
            return s;
        }

        @Override
        public Object loads(String text) {
            return text;
        }
    };
}
