package io.leased;

import java.util.ArrayList;
import java.util.Collection;
import java.util.LinkedHashMap;
import java.util.List;
import java.util.Map;

/**
 * The JSON the protocol needs, with no library: objects as {@code Map},
 * arrays as {@code List}, integers as {@code Long}, other numbers as
 * {@code Double}, strings, booleans and null. Public so that a serializer
 * or an application can use it too.
 */
public final class Json {
    private Json() {}

    /** VALUE as compact JSON text; anything without a JSON form is an IllegalArgumentException. */
    public static String encode(Object value) {
        StringBuilder sb = new StringBuilder();
        write(sb, value);
        return sb.toString();
    }

    /** The value of the JSON TEXT; bad JSON is an IllegalArgumentException. */
    public static Object decode(String text) {
        Parser p = new Parser(text);
        p.space();
        Object v = p.value();
        p.space();
        if (p.i != text.length()) {
            throw p.error("trailing characters");
        }
        return v;
    }

    static void write(StringBuilder sb, Object v) {
        if (v == null) {
            sb.append("null");
        } else if (v instanceof String s) {
            quote(sb, s);
        } else if (v instanceof Boolean) {
            sb.append(v);
        } else if (v instanceof Double || v instanceof Float) {
            double d = ((Number) v).doubleValue();
            if (Double.isNaN(d) || Double.isInfinite(d)) {
                throw new IllegalArgumentException("JSON has no " + d);
            }
            if (d == Math.rint(d) && Math.abs(d) < 1e15) {
                sb.append((long) d).append(".0");
            } else {
                sb.append(d);
            }
        } else if (v instanceof Long || v instanceof Integer || v instanceof Short
                || v instanceof Byte || v instanceof java.math.BigInteger
                || v instanceof java.math.BigDecimal) {
            sb.append(v);
        } else if (v instanceof Map<?, ?> m) {
            sb.append('{');
            boolean first = true;
            for (Map.Entry<?, ?> e : m.entrySet()) {
                if (!(e.getKey() instanceof String k)) {
                    throw new IllegalArgumentException("a JSON object's keys are strings, not "
                            + typeName(e.getKey()));
                }
                if (!first) {
                    sb.append(',');
                }
                first = false;
                quote(sb, k);
                sb.append(':');
                write(sb, e.getValue());
            }
            sb.append('}');
        } else if (v instanceof Collection<?> c) {
            sb.append('[');
            boolean first = true;
            for (Object o : c) {
                if (!first) {
                    sb.append(',');
                }
                first = false;
                write(sb, o);
            }
            sb.append(']');
        } else if (v instanceof Object[] a) {
            write(sb, List.of(a));
        } else {
            throw new IllegalArgumentException(typeName(v) + " has no JSON form");
        }
    }

    static String typeName(Object v) {
        return v == null ? "null" : v.getClass().getName();
    }

    static void quote(StringBuilder sb, String s) {
        sb.append('"');
        for (int i = 0; i < s.length(); i++) {
            char c = s.charAt(i);
            switch (c) {
                case '"' -> sb.append("\\\"");
                case '\\' -> sb.append("\\\\");
                case '\n' -> sb.append("\\n");
                case '\r' -> sb.append("\\r");
                case '\t' -> sb.append("\\t");
                default -> {
                    // Control characters, and the line separators a JavaScript
                    // reader would take for a line end, are escaped.
                    if (c < 0x20 || c == 0x2028 || c == 0x2029) {
                        sb.append(String.format("\\u%04x", (int) c));
                    } else {
                        sb.append(c);
                    }
                }
            }
        }
        sb.append('"');
    }

    private static final class Parser {
        final String s;
        int i;

        Parser(String s) {
            this.s = s;
        }

        IllegalArgumentException error(String what) {
            return new IllegalArgumentException("bad JSON at " + i + ": " + what);
        }

        void space() {
            while (i < s.length()) {
                char c = s.charAt(i);
                if (c != ' ' && c != '\t' && c != '\n' && c != '\r') {
                    return;
                }
                i++;
            }
        }

        char peek() {
            if (i >= s.length()) {
                throw error("unexpected end");
            }
            return s.charAt(i);
        }

        Object value() {
            char c = peek();
            switch (c) {
                case '{':
                    return object();
                case '[':
                    return array();
                case '"':
                    return string();
                case 't':
                    return word("true", Boolean.TRUE);
                case 'f':
                    return word("false", Boolean.FALSE);
                case 'n':
                    return word("null", null);
                default:
                    if (c == '-' || (c >= '0' && c <= '9')) {
                        return number();
                    }
                    throw error("unexpected '" + c + "'");
            }
        }

        Object word(String w, Object v) {
            if (!s.startsWith(w, i)) {
                throw error("expected " + w);
            }
            i += w.length();
            return v;
        }

        Map<String, Object> object() {
            Map<String, Object> m = new LinkedHashMap<>();
            i++;
            space();
            if (peek() == '}') {
                i++;
                return m;
            }
            while (true) {
                space();
                if (peek() != '"') {
                    throw error("expected a key");
                }
                String k = string();
                space();
                if (peek() != ':') {
                    throw error("expected ':'");
                }
                i++;
                space();
                m.put(k, value());
                space();
                char c = peek();
                i++;
                if (c == '}') {
                    return m;
                }
                if (c != ',') {
                    throw error("expected ',' or '}'");
                }
            }
        }

        List<Object> array() {
            List<Object> a = new ArrayList<>();
            i++;
            space();
            if (peek() == ']') {
                i++;
                return a;
            }
            while (true) {
                space();
                a.add(value());
                space();
                char c = peek();
                i++;
                if (c == ']') {
                    return a;
                }
                if (c != ',') {
                    throw error("expected ',' or ']'");
                }
            }
        }

        String string() {
            i++;
            StringBuilder sb = null;
            int start = i;
            while (true) {
                char c = peek();
                if (c == '"') {
                    String out = sb == null ? s.substring(start, i) : sb.toString();
                    i++;
                    return out;
                }
                if (c != '\\') {
                    if (sb != null) {
                        sb.append(c);
                    }
                    i++;
                    continue;
                }
                if (sb == null) {
                    sb = new StringBuilder(s.substring(start, i));
                }
                i++;
                char e = peek();
                i++;
                switch (e) {
                    case '"', '\\', '/' -> sb.append(e);
                    case 'b' -> sb.append('\b');
                    case 'f' -> sb.append('\f');
                    case 'n' -> sb.append('\n');
                    case 'r' -> sb.append('\r');
                    case 't' -> sb.append('\t');
                    case 'u' -> {
                        if (i + 4 > s.length()) {
                            throw error("short \\u escape");
                        }
                        try {
                            sb.append((char) Integer.parseInt(s.substring(i, i + 4), 16));
                        } catch (NumberFormatException ex) {
                            throw error("bad \\u escape");
                        }
                        i += 4;
                    }
                    default -> throw error("bad escape");
                }
            }
        }

        Object number() {
            int start = i;
            boolean real = false;
            if (peek() == '-') {
                i++;
            }
            while (i < s.length()) {
                char c = s.charAt(i);
                if (c >= '0' && c <= '9') {
                    i++;
                } else if (c == '.' || c == 'e' || c == 'E' || c == '+' || c == '-') {
                    real = true;
                    i++;
                } else {
                    break;
                }
            }
            String t = s.substring(start, i);
            try {
                if (!real) {
                    try {
                        return Long.parseLong(t);
                    } catch (NumberFormatException big) {
                        return Double.parseDouble(t);
                    }
                }
                return Double.parseDouble(t);
            } catch (NumberFormatException ex) {
                throw error("bad number " + t);
            }
        }
    }
}
