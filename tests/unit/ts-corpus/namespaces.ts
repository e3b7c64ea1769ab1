// expect: {"area":12.56,"v":"1.0","inner":3,"shape":"circle","merged":true}
namespace Geometry {
    export const PI: number = 3.14;
    const hidden = 2;
    export function circle(r: number): number {
        return PI * r * hidden * r / 2;
    }
    export interface Shape { kind: string }
    export type Kind = "circle";
    export enum Kinds { Circle = "circle" }
    export namespace Inner {
        export const three = 3;
    }
    export class Version { toString(): string { return "1.0"; } }
}
namespace Geometry {
    export const merged = true;
}
declare namespace Ambient { const x: number; }
({ area: Geometry.circle(2), v: String(new Geometry.Version()), inner: Geometry.Inner.three,
   shape: Geometry.Kinds.Circle, merged: Geometry.merged })
